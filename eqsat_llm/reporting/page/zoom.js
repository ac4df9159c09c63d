// zoom and pan by rewriting each drawing's viewBox: no library, nothing to fetch
(function(){
function setup(view){
 var svg=view.querySelector('.canvas svg');if(!svg||!svg.viewBox.baseVal)return;
 var b=svg.viewBox.baseVal,all=[b.x,b.y,b.width,b.height],drag=null;
 svg.removeAttribute('width');svg.removeAttribute('height');
 svg.setAttribute('preserveAspectRatio','xMidYMin meet');
 // first view: the drawing's full width, from the top (a tall program stays readable)
 var aspect=svg.clientHeight/Math.max(1,svg.clientWidth);
 var wide=[all[0],all[1],all[2],Math.min(all[3],all[2]*aspect)||all[3]],box=wide.slice();
 function show(){svg.setAttribute('viewBox',box.join(' '));
  view.dataset.zoom=(all[2]/box[2]).toFixed(2);}
 function at(e){var p=svg.createSVGPoint();p.x=e.clientX;p.y=e.clientY;
  return p.matrixTransform(svg.getScreenCTM().inverse());}
 function zoom(f,c){box=[c.x-(c.x-box[0])/f,c.y-(c.y-box[1])/f,box[2]/f,box[3]/f];show();}
 function middle(){return {x:box[0]+box[2]/2,y:box[1]+box[3]/2};}
 svg.addEventListener('wheel',function(e){e.preventDefault();
  zoom(e.deltaY<0?1.25:0.8,at(e));},{passive:false});
 svg.addEventListener('mousedown',function(e){drag={x:e.clientX,y:e.clientY};
  e.preventDefault();});
 window.addEventListener('mousemove',function(e){if(!drag)return;
  var s=1/svg.getScreenCTM().a;box[0]-=(e.clientX-drag.x)*s;box[1]-=(e.clientY-drag.y)*s;
  drag={x:e.clientX,y:e.clientY};show();});
 window.addEventListener('mouseup',function(){drag=null;});
 view.querySelectorAll('button').forEach(function(btn){btn.addEventListener('click',function(){
  var act=btn.dataset.act;
  if(act==='width'||act==='all'){box=(act==='all'?all:wide).slice();show();}
  else zoom(act==='in'?1.5:1/1.5,middle());});});
 show();
}
document.querySelectorAll('.viewer').forEach(setup);
document.documentElement.dataset.scriptsRan='yes';
})();
